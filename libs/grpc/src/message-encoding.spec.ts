import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  create,
  createFileRegistry,
  fromBinary,
  ScalarType,
  toBinary,
  type DescField,
  type DescMessage,
  type FileRegistry,
} from '@bufbuild/protobuf';
import { FileDescriptorSetSchema } from '@bufbuild/protobuf/wkt';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { InferRequestSchema, InferResponseSchema } from '@infermesh/proto/gen/infermesh/worker/v1/worker_pb';
import { ListModelsResponseSchema } from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { encodeMessage } from './message-encoding';

/** The test messages of testdata/, compiled by buf as the project's own protos are. */
function loadTestMessages(): FileRegistry {
  const dir = mkdtempSync(join(tmpdir(), 'encoding-'));
  try {
    const image = join(dir, 'image.binpb');
    execFileSync(require.resolve('@bufbuild/buf/bin/buf'), ['build', join(__dirname, 'testdata'), '-o', image]);
    return createFileRegistry(fromBinary(FileDescriptorSetSchema, readFileSync(image)));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** A seeded generator, so that a failing case can be replayed. */
function random(seed: number) {
  let state = seed >>> 0;
  const next = () => {
    state = (Math.imul(state ^ (state >>> 15), 0x2c1b3c6d) + 0x9e3779b9) >>> 0;
    return state / 0x100000000;
  };
  const int = (n: number) => Math.floor(next() * n);
  const pick = <T>(values: readonly T[]): T => values[int(values.length)]!;
  return { next, int, pick };
}

type Random = ReturnType<typeof random>;

const STRINGS = [
  '',
  'a',
  'tiny',
  'ünïcödé',
  '模型',
  '🙂 emoji',
  'lone \ud800 surrogate',
  'x'.repeat(127),
  'y'.repeat(128),
];
const INT32S = [0, 1, -1, 127, 128, 16383, 16384, 2 ** 31 - 1, -(2 ** 31), 300, -300];
const UINT32S = [0, 1, 127, 128, 2 ** 21, 2 ** 28, 2 ** 32 - 1];
const INT64S = [0n, 1n, -1n, 2n ** 63n - 1n, -(2n ** 63n), 2n ** 35n, -(2n ** 40n)];
const UINT64S = [0n, 1n, 2n ** 64n - 1n, 2n ** 35n];
const FLOATS = [0, -0, 1.5, -2.25, Number.NaN, Infinity, -Infinity, 3.4e38];
const BYTE_LENGTHS = [0, 1, 127, 128, 300, 16384];

function scalarValue(rng: Random, scalar: ScalarType, longAsString: boolean): unknown {
  switch (scalar) {
    case ScalarType.DOUBLE:
      return rng.pick([...FLOATS, 1e300, Math.PI]);
    case ScalarType.FLOAT:
      return rng.pick(FLOATS);
    case ScalarType.INT64:
    case ScalarType.SFIXED64:
    case ScalarType.SINT64: {
      const value = rng.pick(INT64S);
      return longAsString ? value.toString() : value;
    }
    case ScalarType.UINT64:
    case ScalarType.FIXED64:
      return rng.pick(UINT64S);
    case ScalarType.INT32:
    case ScalarType.SFIXED32:
    case ScalarType.SINT32:
      return rng.pick(INT32S);
    case ScalarType.UINT32:
    case ScalarType.FIXED32:
      return rng.pick(UINT32S);
    case ScalarType.BOOL:
      return rng.next() < 0.5;
    case ScalarType.STRING:
      return rng.pick(STRINGS);
    case ScalarType.BYTES:
      return Uint8Array.from({ length: rng.pick(BYTE_LENGTHS) }, (_, i) => (i * 7 + 3) & 0xff);
  }
}

function mapKey(rng: Random, key: ScalarType): string {
  switch (key) {
    case ScalarType.BOOL:
      return rng.pick(['true', 'false']);
    case ScalarType.STRING:
      return rng.pick(STRINGS);
    default:
      return String(rng.pick(INT32S));
  }
}

/** A message filled at random: each field set or not, lists and maps of 0–3 entries, nesting to `depth`. */
function randomMessage(rng: Random, desc: DescMessage, depth: number): Record<string, unknown> {
  const init: Record<string, unknown> = {};
  for (const field of desc.fields) {
    if (rng.next() < 0.35) continue;
    const value = fieldValue(rng, field, depth);
    if (value === undefined) continue;
    if (field.oneof) init[field.oneof.localName] = { case: field.localName, value };
    else init[field.localName] = value;
  }
  return init;
}

function fieldValue(rng: Random, field: DescField, depth: number): unknown {
  const one = (): unknown => {
    switch (field.fieldKind) {
      case 'scalar':
        return scalarValue(rng, field.scalar, field.longAsString);
      case 'enum':
        return rng.pick(field.enum.values).number;
      case 'list':
        return field.listKind === 'scalar'
          ? scalarValue(rng, field.scalar, field.longAsString)
          : field.listKind === 'enum'
            ? rng.pick(field.enum.values).number
            : messageValue(field.message);
      case 'map':
        return undefined;
      case 'message':
        return messageValue(field.message);
    }
  };
  const messageValue = (message: DescMessage): unknown => {
    if (message.typeName === 'google.protobuf.Struct') return { a: 1, b: ['x', true, null] };
    if (message.typeName === 'google.protobuf.Value')
      return create(message, { kind: { case: 'numberValue', value: 2 } });
    if (message.typeName === 'google.protobuf.StringValue') return field.oneof ? { value: 'w' } : 'wrapped';
    if (message.typeName === 'google.protobuf.Int32Value') return { value: rng.pick(INT32S) };
    return depth > 0 ? randomMessage(rng, message, depth - 1) : undefined;
  };
  const count = rng.int(4);
  switch (field.fieldKind) {
    case 'list':
      return Array.from({ length: count }, one).filter((v) => v !== undefined);
    case 'map': {
      const record: Record<string, unknown> = {};
      for (let i = 0; i < count; i++) {
        const value =
          field.mapKind === 'scalar'
            ? scalarValue(rng, field.scalar, false)
            : field.mapKind === 'enum'
              ? rng.pick(field.enum.values).number
              : messageValue(field.message);
        if (value !== undefined) record[mapKey(rng, field.mapKey)] = value;
      }
      return record;
    }
    default:
      return one();
  }
}

describe('encodeMessage', () => {
  const registry = loadTestMessages();
  const everything = registry.getMessage('infermesh.test.encoding.Everything')!;
  const fewer = registry.getMessage('infermesh.test.encoding.Fewer')!;
  const legacy = registry.getMessage('infermesh.test.encoding.legacy.Legacy')!;
  const required = registry.getMessage('infermesh.test.encoding.legacy.Required')!;

  const expectSameBytes = (desc: DescMessage, message: object) => {
    const expected = Buffer.from(toBinary(desc, message as never));
    const actual = encodeMessage(desc, message);
    expect(actual.equals(expected)).toBe(true);
    return actual;
  };

  it('writes the bytes toBinary writes, for messages of every field kind filled at random', () => {
    for (let seed = 1; seed <= 400; seed++) {
      const message = create(everything, randomMessage(random(seed), everything, 3) as never);
      try {
        expectSameBytes(everything, message);
      } catch (error) {
        throw new Error(`seed ${seed}: ${String(error)}`);
      }
    }
  });

  it('writes every field kind when each is set, including zero values of optional fields', () => {
    const message = create(everything, {
      scalars: {
        fDouble: -0,
        fFloat: 1.25,
        fInt64: -5n,
        fUint64: 2n ** 64n - 1n,
        fInt32: -1,
        fFixed64: 9n,
        fFixed32: 4,
        fBool: true,
        fString: 'héllo',
        fBytes: new Uint8Array([1, 2, 3]),
        fUint32: 2 ** 32 - 1,
        fEnum: -3,
        fSfixed32: -8,
        fSfixed64: -9n,
        fSint32: -10,
        fSint64: -11n,
        fInt64String: '-12',
      },
      optInt32: 0,
      optString: '',
      optEnum: 0,
      optBool: false,
      rSint32: [1, -1],
      choice: { case: 'cWrapper', value: { value: 0 } },
      withWrapper: { name: 'wrapped', plain: 3 },
      withStruct: { attributes: { nested: { list: [1, 'two'] } } },
      withIntKeys: { byNumber: { '-4': 'minus four', 7: 'seven' }, byFlag: { true: 'yes' } },
    });

    const bytes = expectSameBytes(everything, message);

    expect(fromBinary(everything, bytes)).toEqual(message);
  });

  it('writes nested lengths of every varint width, and tensors of megabytes', () => {
    for (const length of [127, 128, 16383, 16384, 2 ** 21 - 10, 2 ** 21 + 10, 3_500_000]) {
      const data = new Uint8Array(length).fill(0xab);
      const request = create(InferRequestSchema, {
        request: {
          modelName: 'cnn',
          modelVersion: '3',
          id: 'req-1',
          inputs: [{ name: 'input', datatype: DataType.FP32, shape: [32n, 3n, 48n, 192n], data }],
          outputNames: ['logits'],
          parameters: { priority: { parameterChoice: { case: 'int64Param', value: 5n } } },
          outputClassCounts: { logits: 3 },
        },
      });
      expectSameBytes(InferRequestSchema, request);
    }
  });

  it('writes the services messages as toBinary does', () => {
    const response = create(InferResponseSchema, {
      response: {
        modelName: 'mlp',
        outputs: [{ name: 'probabilities', datatype: DataType.FP32, shape: [32n, 10n], data: new Uint8Array(1280) }],
        cached: true,
      },
    });
    expectSameBytes(InferResponseSchema, response);
    expectSameBytes(
      ListModelsResponseSchema,
      create(ListModelsResponseSchema, randomMessage(random(7), ListModelsResponseSchema, 4) as never),
    );
  });

  it('keeps unknown fields, after the known ones', () => {
    const full = create(everything, { ...randomMessage(random(11), everything, 2), rString: ['carried'] });
    const partial = fromBinary(fewer, toBinary(everything, full));

    expect(partial.$unknown?.length).toBeGreaterThan(0);
    expectSameBytes(fewer, partial);
  });

  it('writes proto2 messages (required fields, groups, defaults) as toBinary does', () => {
    expectSameBytes(legacy, create(legacy, { id: 0, numbers: [1, -2, 300], inner: { depth: 4 } }));
    expectSameBytes(legacy, create(legacy, { id: 5, name: 'unnamed' }));
    expectSameBytes(required, create(required, { id: 0, note: 'n', blob: new Uint8Array([1]) }));
  });

  it('refuses what toBinary refuses, naming the field', () => {
    const message = create(everything, { scalars: { fInt32: 1.5 } });
    expect(() => toBinary(everything, message)).toThrow();
    expect(() => encodeMessage(everything, message)).toThrow(
      'cannot encode field infermesh.test.encoding.Scalars.f_int32 to binary: invalid int32: 1.5',
    );

    const unsigned = create(everything, { rUint32: [1, -1] });
    expect(() => toBinary(everything, unsigned)).toThrow();
    expect(() => encodeMessage(everything, unsigned)).toThrow(
      'cannot encode field infermesh.test.encoding.Everything.r_uint32 to binary: invalid uint32: -1',
    );

    const missing = create(required, { note: 'no id' });
    expect(() => toBinary(required, missing)).toThrow('required field not set');
    expect(() => encodeMessage(required, missing)).toThrow('required field not set');
  });

  it('gives bytes that are kept a buffer of their own, of their exact size', () => {
    const message = create(fewer, { scalars: { fString: 'kept' } });

    const bytes = encodeMessage(fewer, message, { ownBuffer: true });

    expect(bytes.buffer.byteLength).toBe(bytes.byteLength);
    expect(bytes.equals(Buffer.from(toBinary(fewer, message)))).toBe(true);

    const withoutBytes = registry.getMessage('infermesh.test.encoding.WithIntKeys')!;
    const keyed = create(withoutBytes, { byNumber: { 3: 'three' } });
    const whole = encodeMessage(withoutBytes, keyed, { ownBuffer: true });
    expect(whole.buffer.byteLength).toBe(whole.byteLength);
    expect(whole.equals(Buffer.from(toBinary(withoutBytes, keyed)))).toBe(true);
  });

  it('refuses a message of another type', () => {
    expect(() => encodeMessage(everything, create(fewer))).toThrow(
      'cannot encode a infermesh.test.encoding.Fewer message as infermesh.test.encoding.Everything',
    );
  });
});
