"""The compositions of the pytorch-programs style, one module per task (named as the task).

Each task module defines SPACE, a compose.TaskSpace: how custom_kernel(data) calls the program's
core, the block sizes of the Python-level drivers, and the compositions with their knobs.
"""
