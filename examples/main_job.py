"""The main job: plan a real model on a real cluster shape and show the plan."""
import weft

print("weft", weft.__version__)
