"""Preset SCOT factor files (TOML); installed as the package ``octopis.presets``."""
