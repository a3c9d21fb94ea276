"""The main job: train the example tool-choice agent end to end on embedded defaults (``make train``)."""
