import { unservableBytesElement } from './bytes-elements';

describe(unservableBytesElement.name, () => {
  it('passes UTF-8 text, empty and multi-byte elements included', () => {
    expect(
      unservableBytesElement(['hello', '', 'héllo ✓', '🙂', '日本語'].map((s) => Buffer.from(s, 'utf8'))),
    ).toBeUndefined();
  });

  it('names the first element with a NUL byte, which onnxruntime-node would cut short', () => {
    const sut = unservableBytesElement([Buffer.from('ok'), Buffer.from('a\u0000b'), Buffer.from([0xff])]);

    expect(sut).toEqual({ index: 1, problem: 'contains a NUL byte' });
  });

  it.each([
    ['a lone continuation byte', [0x80]],
    ['a byte never used in UTF-8', [0x41, 0xff]],
    ['a truncated sequence', [0xe6, 0x97]],
    ['an encoded surrogate', [0xed, 0xa0, 0x80]],
  ])('names an element that is not UTF-8: %s', (_label, bytes) => {
    expect(unservableBytesElement([Buffer.from('ok'), Buffer.from(bytes)])).toEqual({
      index: 1,
      problem: 'is not valid UTF-8',
    });
  });
});
