"""Configuration: every variable declared once (:mod:`.registry`), one resolution order
(:mod:`.resolve`), and the typed settings each component reads (:mod:`.keeper`, :mod:`.events`)."""
