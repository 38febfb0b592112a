"""A simulated Jetson AGX Orin: a fake sysfs tree with the real layout, a board that reacts to pins, an energy model."""
