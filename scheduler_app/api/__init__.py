"""The REST API: ``path("api/scheduler/", include("scheduler_app.api.urls"))``.

Views call the services in ``scheduler_app.services``; ``errors`` maps every
exception to one JSON shape, ``permissions`` decides who may call what, and
``openapi`` serves the schema and its browsable page (the ``openapi`` extra).
"""
