"""Other APIs' shapes over tether's sessions and turns (DESIGN §9): each face is a router."""
