"""verifierd."""
