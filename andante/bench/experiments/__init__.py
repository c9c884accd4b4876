"""One module per reproduced paper evaluation."""
