"""What a run leaves on disk, with one owner of its paths (`directory.RunDir`, and the lock):
checkpoint files (`checkpoint`) and the checkpointer that saves, finds and resumes them
(`checkpointer`), evaluation and prediction outputs (`outputs`), reports (`report`) and ONNX
export (`export`)."""
