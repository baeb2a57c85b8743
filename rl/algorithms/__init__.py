"""Update rules, one module each."""
