"""Counts the decode graph replays of whichever SGLang is installed, by patching its graph runner class."""
