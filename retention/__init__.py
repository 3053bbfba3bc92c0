"""The retention evaluator (PAMSPEC 9.6, 16.2): proposes expirations as explicit transition commands."""
