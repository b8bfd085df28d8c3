"""The transducer family: one lattice recursion (``lattice/``) under every transducer loss."""
