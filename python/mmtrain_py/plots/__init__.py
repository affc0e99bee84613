"""Figures drawn with matplotlib from the specs mmtrain computes (figures.py)."""
