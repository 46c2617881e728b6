"""The file layer above ``format``: mapped data files and their views (``datafile``), the
writer's item layout (``items``) and the one atomic replacement (``commit``)."""
