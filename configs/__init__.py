"""Preset pipeline configurations (YAML), shipped as package data."""
