"""What the node host hands its output to, recorded (tests of runtime/nodehost.py)."""


class RecordingOutput:
    def __init__(self, lines_as=lambda line: line.text):
        self.started, self.lines, self.exited = [], [], []
        self._lines_as = lines_as

    def on_started(self, event):
        self.started.append(event)

    def on_lines(self, batches):
        for _running, lines in batches:
            self.lines.extend(map(self._lines_as, lines))

    def on_exited(self, event):
        self.exited.append(event)
