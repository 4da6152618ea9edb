"""FUSE process handling shared by mount and slowfs: run a server, wait, unmount, clean up."""
