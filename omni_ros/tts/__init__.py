"""Text to speech for voice feedback: engines, chunk scheduling, resampling, sinks.

Importing this package is cheap; engines load their libraries when created.
"""
