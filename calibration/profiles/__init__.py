"""Shipped calibration profiles (servesim-profile JSON files), read with
calibration.profile.load_profile."""
