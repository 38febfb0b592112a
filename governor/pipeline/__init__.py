"""The model pipeline: characterize -> dataset -> train -> export -> evaluate (never imported by the daemon)."""
