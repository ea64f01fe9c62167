import { DataType } from './datatypes';
import { flattenJsonData, jsonToRaw, rawToJson, TensorDataError } from './json-data';

function roundTrip(type: DataType, data: unknown[]): unknown[] {
  return rawToJson(type, jsonToRaw('x', type, data, data.length));
}

function refusal(fn: () => unknown): TensorDataError {
  try {
    fn();
  } catch (error) {
    if (error instanceof TensorDataError) return error;
    throw error;
  }
  throw new Error('expected a TensorDataError');
}

describe('jsonToRaw', () => {
  describe('round trip with rawToJson', () => {
    it.each<[string, DataType, unknown[], number]>([
      ['BOOL', DataType.BOOL, [true, false, true], 1],
      ['UINT8', DataType.UINT8, [0, 1, 255], 1],
      ['UINT16', DataType.UINT16, [0, 300, 65535], 2],
      ['UINT32', DataType.UINT32, [0, 70_000, 4_294_967_295], 4],
      ['UINT64', DataType.UINT64, [0, 2 ** 53 - 1, '9007199254740993', '18446744073709551615'], 8],
      ['INT8', DataType.INT8, [-128, 0, 127], 1],
      ['INT16', DataType.INT16, [-32768, -1, 32767], 2],
      ['INT32', DataType.INT32, [-2_147_483_648, -1, 2_147_483_647], 4],
      [
        'INT64',
        DataType.INT64,
        [-(2 ** 53 - 1), 0, 2 ** 53 - 1, '9007199254740993', '-9223372036854775808', '9223372036854775807'],
        8,
      ],
      ['FP16', DataType.FP16, [0, 1, -2, 0.5, 65504, 2 ** -24], 2],
      ['BF16', DataType.BF16, [0, 1, -2, 3.140625, 2 ** 100], 2],
      ['FP32', DataType.FP32, [0, 1.5, -2.25, 3.4028234663852886e38, 2 ** -149], 4],
      ['FP64', DataType.FP64, [0, 0.1, -1e308, Number.MIN_VALUE, Math.PI], 8],
    ])('%s keeps every value at its width', (name, type, data, width) => {
      const raw = jsonToRaw('x', type, data, data.length);

      expect(raw.length).toBe(data.length * width);
      const back = rawToJson(type, raw);
      // Reduced-width floats come back in their shortest decimal form: the same bits, fewer digits.
      expect(jsonToRaw('x', type, back, data.length).equals(raw)).toBe(true);
      if (!['FP16', 'BF16', 'FP32'].includes(name)) expect(back).toEqual(data);
    });

    it('BYTES keeps every string, empty and multi-byte ones included, length-prefixed', () => {
      const data = ['hello', '', 'héllo ✓', '\u0000', '🙂'];

      const raw = jsonToRaw('x', DataType.BYTES, data, data.length);

      expect(raw.readUInt32LE(0)).toBe(5);
      expect(raw.subarray(4, 9).toString()).toBe('hello');
      expect(raw.readUInt32LE(9)).toBe(0);
      expect(rawToJson(DataType.BYTES, raw)).toEqual(data);
    });

    it('writes little-endian bytes', () => {
      expect([...jsonToRaw('x', DataType.INT32, [1, -2], 2)]).toEqual([1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff]);
      expect([...jsonToRaw('x', DataType.FP32, [1], 1)]).toEqual([0, 0, 0x80, 0x3f]);
    });

    it('rounds FP32, FP16 and BF16 values to the nearest representable one', () => {
      // Each comes back in the shortest decimal that reads to the same bits, so a nearby input reads as 0.1.
      expect(roundTrip(DataType.FP32, [0.1000000001])).toEqual([0.1]);
      expect(Math.fround(roundTrip(DataType.FP32, [0.1])[0] as number)).toBe(Math.fround(0.1));
      expect(roundTrip(DataType.FP16, [0.1])).toEqual([0.1]);
      expect(roundTrip(DataType.FP16, [0.10004])).toEqual([0.10004]); // the next FP16 after 0.1
      expect(roundTrip(DataType.BF16, [0.1001])).toEqual([0.1]);
    });

    it('flattens nested data row-major', () => {
      const nested = [
        [
          [1, 2],
          [3, 4],
        ],
        [
          [5, 6],
          [7, 8],
        ],
      ];

      expect(rawToJson(DataType.INT32, jsonToRaw('x', DataType.INT32, nested, 8))).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
      expect(rawToJson(DataType.BYTES, jsonToRaw('x', DataType.BYTES, [['a', 'b'], ['c']], 3))).toEqual([
        'a',
        'b',
        'c',
      ]);
    });

    it('accepts a scalar as one element', () => {
      expect(rawToJson(DataType.FP64, jsonToRaw('x', DataType.FP64, 2.5, 1))).toEqual([2.5]);
    });

    it('returns 64-bit integers beyond 2^53 as exact decimal strings, and safe ones as numbers', () => {
      const raw = jsonToRaw('x', DataType.INT64, ['9007199254740993', '-9007199254740993', '42'], 3);

      expect(rawToJson(DataType.INT64, raw)).toEqual(['9007199254740993', '-9007199254740993', 42]);
    });
  });

  describe('refusals', () => {
    it('refuses data whose element count differs from the shape, naming the tensor and both counts', () => {
      const error = refusal(() => jsonToRaw('pixels', DataType.FP32, [[1, 2], [3]], 4));

      expect(error.message).toBe('input "pixels": data has 3 elements but its shape needs 4');
    });

    it.each<[string, DataType, unknown, string]>([
      ['UINT8 256', DataType.UINT8, 256, 'an integer in the UINT8 range [0, 255]'],
      ['UINT8 -1', DataType.UINT8, -1, 'an integer in the UINT8 range [0, 255]'],
      ['UINT16 65536', DataType.UINT16, 65536, 'an integer in the UINT16 range [0, 65535]'],
      ['UINT32 2^32', DataType.UINT32, 2 ** 32, 'an integer in the UINT32 range [0, 4294967295]'],
      ['INT8 128', DataType.INT8, 128, 'an integer in the INT8 range [-128, 127]'],
      ['INT16 -32769', DataType.INT16, -32769, 'an integer in the INT16 range [-32768, 32767]'],
      ['INT32 2^31', DataType.INT32, 2 ** 31, 'an integer in the INT32 range [-2147483648, 2147483647]'],
      ['INT32 -2^31-1', DataType.INT32, -(2 ** 31) - 1, 'an integer in the INT32 range [-2147483648, 2147483647]'],
      ['INT32 1.5', DataType.INT32, 1.5, 'an integer in the INT32 range [-2147483648, 2147483647]'],
      ['INT32 "7"', DataType.INT32, '7', 'an integer in the INT32 range [-2147483648, 2147483647]'],
      ['INT64 2^63', DataType.INT64, '9223372036854775808', 'an integer in the INT64 range'],
      ['INT64 unsafe number', DataType.INT64, 2 ** 60, 'an integer in the INT64 range'],
      ['INT64 "1e3"', DataType.INT64, '1e3', 'an integer in the INT64 range'],
      ['INT64 " 12"', DataType.INT64, ' 12', 'an integer in the INT64 range'],
      ['UINT64 2^64', DataType.UINT64, '18446744073709551616', 'an integer in the UINT64 range'],
      ['UINT64 -1', DataType.UINT64, -1, 'an integer in the UINT64 range'],
      ['BOOL 1', DataType.BOOL, 1, 'a boolean'],
      ['BYTES 1', DataType.BYTES, 1, 'a string'],
      ['BYTES with a lone high surrogate', DataType.BYTES, 'a\ud800', 'well-formed Unicode (it has a lone surrogate)'],
      ['BYTES with a lone low surrogate', DataType.BYTES, '\udc00b', 'well-formed Unicode (it has a lone surrogate)'],
      ['FP32 "1.5"', DataType.FP32, '1.5', 'a finite number'],
      ['FP32 null', DataType.FP32, null, 'a finite number'],
      ['FP64 true', DataType.FP64, true, 'a finite number'],
      ['FP32 1e39', DataType.FP32, 1e39, 'within the FP32 range'],
      ['FP16 65520', DataType.FP16, 65520, 'within the FP16 range'],
      ['BF16 1e39', DataType.BF16, 1e39, 'within the BF16 range'],
      ['BF16 3.4e38', DataType.BF16, 3.4e38, 'within the BF16 range'],
    ])('refuses %s, naming the tensor, the element and the rule', (_label, type, value, rule) => {
      const error = refusal(() => jsonToRaw('features', type, [value], 1));

      expect(error.message).toBe(
        `input "features": element 0 (${typeof value === 'number' ? String(value) : JSON.stringify(value)}) is not ${rule}`,
      );
    });

    it.each([
      ['NaN', NaN],
      ['Infinity', Infinity],
      ['-Infinity', -Infinity],
    ])('refuses %s for every float type, showing the value as it is', (label, value) => {
      for (const type of [DataType.FP16, DataType.BF16, DataType.FP32, DataType.FP64]) {
        const error = refusal(() => jsonToRaw('features', type, [1, 2, value], 3));
        expect(error.message).toBe(`input "features": element 2 (${label}) is not a finite number`);
      }
    });

    it('refuses a number JSON parsed as Infinity, showing it as Infinity rather than null', () => {
      const data = JSON.parse('[1, 1e999]') as unknown[];

      expect(refusal(() => jsonToRaw('x', DataType.FP64, data, 2)).message).toBe(
        'input "x": element 1 (Infinity) is not a finite number',
      );
    });

    it('accepts the largest value of each float type as printed by float32 and float64 formatters', () => {
      expect(roundTrip(DataType.FP32, [3.4028235e38, -3.4028235e38])).toEqual([3.4028235e38, -3.4028235e38]);
      expect(roundTrip(DataType.FP16, [65504, -65504])).toEqual([65504, -65504]);
      expect(roundTrip(DataType.BF16, [3.3895313892515355e38])).toEqual([3.39e38]);
      expect(roundTrip(DataType.FP64, [Number.MAX_VALUE])).toEqual([Number.MAX_VALUE]);
    });

    it('refuses the first bad element even when later ones are bad too', () => {
      expect(refusal(() => jsonToRaw('x', DataType.UINT8, [1, 300, -5], 3)).message).toContain('element 1 (300)');
    });
  });
});

describe('rawToJson', () => {
  it('refuses BYTES data with a broken length prefix', () => {
    const broken = Buffer.from([5, 0, 0, 0, 0x61]);

    expect(refusal(() => rawToJson(DataType.BYTES, broken)).message).toContain('broken length prefix');
    expect(refusal(() => rawToJson(DataType.BYTES, Buffer.from([1, 0]))).message).toContain('broken length prefix');
  });

  it('reads a view into a larger buffer from its own offset', () => {
    const backing = Buffer.from([0xff, 1, 0, 2, 0, 0xff]);

    expect(rawToJson(DataType.UINT16, backing.subarray(1, 5))).toEqual([1, 2]);
  });

  it('decodes any non-zero BOOL byte as true', () => {
    expect(rawToJson(DataType.BOOL, Buffer.from([0, 1, 2, 255]))).toEqual([false, true, true, true]);
  });

  it('decodes FP16 and BF16 infinities and NaN', () => {
    expect(rawToJson(DataType.FP16, Buffer.from([0x00, 0x7c, 0x00, 0xfc]))).toEqual([Infinity, -Infinity]);
    expect(rawToJson(DataType.BF16, Buffer.from([0xc0, 0x7f]))[0]).toBeNaN();
  });
});

describe('flattenJsonData', () => {
  it('keeps flat data as is and flattens deep nesting in order', () => {
    expect(flattenJsonData([1, 2, 3])).toEqual([1, 2, 3]);
    expect(flattenJsonData([[[[1]], [[2, 3]]], [[[4]]]])).toEqual([1, 2, 3, 4]);
    expect(flattenJsonData([])).toEqual([]);
    expect(flattenJsonData([[], [1]])).toEqual([1]);
  });
});
