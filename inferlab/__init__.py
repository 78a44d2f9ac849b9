"inferlab: a literate, tested reference implementation of the LLM inference stack."
__version__ = "0.1.0"
