"""The language-model policy family (`--model.kind lm`)."""
