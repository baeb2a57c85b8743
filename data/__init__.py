"""codemill.data: pure corpus logic (sources, filters, dedup, split, tokenize, pack). No Prefect here."""
