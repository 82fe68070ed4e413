from pipeline.cli import app

app()
