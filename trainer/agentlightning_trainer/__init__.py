"""Agent Lightning trainers: LightningRL (GRPO/PPO), APO and SFT."""

__all__: list[str] = []
