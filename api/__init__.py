"""Models and names shared by the fracgpu controller and node plugin."""
