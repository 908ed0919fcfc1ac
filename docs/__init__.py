"""The user guide, one Markdown page per topic, installed as `edgedistill.docs` so that a page an error or a help text
names (`common.guide.page`) is on the disk of a user who installed the wheel, as in a checkout."""
