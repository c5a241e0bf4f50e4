"""Graphs: topologies, mixing weights, time-varying schedules, trees, adaptive graphs."""
