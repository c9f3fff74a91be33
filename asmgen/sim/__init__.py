"""A functional simulator of gfx950 (CDNA4) that runs real code objects.

    program = asmgen.sim.load(open("kernel.co", "rb").read())
    memory = asmgen.sim.Memory()
    q = memory.put(q_array)
    program.launch("kernel_symbol", grid=(4, 1, 1), block=(512, 1, 1), kernarg=packed_args, memory=memory)

See docs/simulator.md for the machine model, what is checked, and the instruction table with its sources.
"""

from .errors import DeadlockError, HazardError, MemoryFault, SimError
from .isa import table as instruction_table
from .machine import LaunchStats, Program, load
from .memory import BufferResource, Memory

__all__ = ["BufferResource", "DeadlockError", "HazardError", "LaunchStats", "Memory", "MemoryFault", "Program",
           "SimError", "instruction_table", "load"]
