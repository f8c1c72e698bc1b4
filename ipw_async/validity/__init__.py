"""Was a run valid, and how well does it know its figures: over-saturation, the steady-state
window, and the precision of its means."""
