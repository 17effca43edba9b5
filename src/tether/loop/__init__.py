"""The turn loop, one module per step: prepare → (model step → tools)* → resolve.

It reads history through a reader and writes through a fenced sink the scheduler hands it
(:mod:`.context`); it never touches the store or HTTP itself.
"""
