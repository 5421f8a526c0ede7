"""Training of the embedded default model (masked diffusion, LLaDA SFT objective) and of its
same-size autoregressive twin, on the synthetic task suite."""
