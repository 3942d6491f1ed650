"""Shared pytest configuration: make ``tests`` importable as a package."""
