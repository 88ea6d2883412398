"""Pictures of what the factory did and plans: static HTML pages with inline SVG, no script
needed and no server (a file, an S3 object or a CI artifact shows the same).

``build_report``: one cell's build (objects over time, memory against the prediction and the
cap); ``coverage``: the matrix against the store (built, missing, cannot build); ``lanes``: a
schedule's builders and slots over time. ``page`` holds the page shell and the SVG pieces
they share.
"""
