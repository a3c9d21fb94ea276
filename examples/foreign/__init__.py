"""Foreign-traces example: a ticket router traced by OpenInference alone, trained with LightningRL (README.md)."""
