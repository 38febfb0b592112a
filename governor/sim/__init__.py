"""A simulated Jetson Orin: fake sysfs trees with the real layouts (AGX Orin on JetPack 5 and 6, Orin NX/Nano), a board
process that reacts to what is written into them, an energy model, and simulated jobs."""
