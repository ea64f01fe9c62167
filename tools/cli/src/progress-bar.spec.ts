import { ProgressBar, type ProgressMode } from './progress-bar';

const MiB = 1024 * 1024;

/** A sink that keeps what is written, and a clock the spec moves. */
function fixture(mode: ProgressMode, totalBytes = 8 * MiB) {
  const written: string[] = [];
  let nowMs = 0;
  const sut = new ProgressBar(
    { write: (text: string) => written.push(text), isTTY: mode === 'bar' },
    {
      label: 'Uploading m.onnx',
      totalBytes,
      mode,
      now: () => nowMs,
      width: 10,
    },
  );
  return { sut, written, advance: (ms: number) => (nowMs += ms) };
}

describe(ProgressBar.name, () => {
  it('writes a line at each quarter when stderr is not a terminal, with the bytes done, the total and the rate', () => {
    const { sut, written, advance } = fixture('lines');

    for (let done = MiB; done <= 8 * MiB; done += MiB) {
      advance(500);
      sut.update(done);
    }
    sut.finish();

    expect(written).toEqual([
      'Uploading m.onnx: 25% (2.0 MiB of 8.0 MiB, 2.0 MiB/s)\n',
      'Uploading m.onnx: 50% (4.0 MiB of 8.0 MiB, 2.0 MiB/s)\n',
      'Uploading m.onnx: 75% (6.0 MiB of 8.0 MiB, 2.0 MiB/s)\n',
      'Uploading m.onnx: 100% (8.0 MiB of 8.0 MiB, 2.0 MiB/s)\n',
    ]);
  });

  it('ends an upload that stopped short with the share it reached', () => {
    const { sut, written, advance } = fixture('lines');

    advance(1000);
    sut.update(3 * MiB);
    sut.finish();

    expect(written).toEqual([
      'Uploading m.onnx: 25% (3.0 MiB of 8.0 MiB, 3.0 MiB/s)\n',
      'Uploading m.onnx: 38% (3.0 MiB of 8.0 MiB, 3.0 MiB/s)\n',
    ]);
  });

  it('redraws one line in place on a terminal, at most every 100 ms until the end, and ends the line when done', () => {
    const { sut, written, advance } = fixture('bar');

    advance(1000);
    sut.update(2 * MiB);
    advance(50);
    sut.update(3 * MiB); // too soon after the last redraw
    advance(950);
    sut.update(8 * MiB);
    sut.finish();

    expect(written).toEqual([
      '\rUploading m.onnx [###-------]  25% (2.0 MiB of 8.0 MiB, 2.0 MiB/s)\x1b[K',
      '\rUploading m.onnx [##########] 100% (8.0 MiB of 8.0 MiB, 4.0 MiB/s)\x1b[K',
      '\rUploading m.onnx [##########] 100% (8.0 MiB of 8.0 MiB, 4.0 MiB/s)\x1b[K\n',
    ]);
  });

  it('shows an empty file as complete', () => {
    const { sut, written } = fixture('lines', 0);

    sut.update(0);
    sut.finish();

    expect(written).toEqual(['Uploading m.onnx: 100% (0 B of 0 B)\n']);
  });

  it('writes nothing when off (--json)', () => {
    const { sut, written, advance } = fixture('off');

    advance(10);
    sut.update(8 * MiB);
    sut.finish();

    expect(written).toEqual([]);
  });
});
