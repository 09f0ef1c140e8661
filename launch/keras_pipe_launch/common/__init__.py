"""What several of the launcher's programs share; imports nothing of them (nor of the command line)."""
