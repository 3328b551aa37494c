"""Training policies on demonstration datasets (`omni-ros train`)."""
