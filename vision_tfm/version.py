"""The package version, on the lowest floor so that checkpoints and exports can record it."""

__version__ = "0.1.0"
