"""Forecasting any kernel from what a user has: its task, hardware and source."""
