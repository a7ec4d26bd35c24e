"""Serving: the SavedModel export (signatures, warm-up requests, the best export) and a
client that classifies image files with it."""
