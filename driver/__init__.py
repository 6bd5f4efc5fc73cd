"""spotring driver."""
