import { create } from '@bufbuild/protobuf';
import { createHash } from 'node:crypto';
import { DataType, InferenceRequestSchema } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { cacheKey } from './cache-key';

interface TensorInit {
  name: string;
  datatype: DataType;
  shape: bigint[];
  data: Uint8Array;
}
interface RequestInit {
  modelName: string;
  modelVersion?: string;
  id?: string;
  inputs: TensorInit[];
  outputNames?: string[];
  outputClassCounts?: Record<string, number>;
}

const base: RequestInit = {
  modelName: 'mlp',
  modelVersion: '3',
  id: 'client-request-1',
  inputs: [
    { name: 'a', datatype: DataType.FP32, shape: [1n, 2n], data: Uint8Array.of(1, 2, 3, 4, 5, 6, 7, 8) },
    { name: 'b', datatype: DataType.INT32, shape: [1n], data: Uint8Array.of(9, 0, 0, 0) },
  ],
  outputNames: ['y', 'z'],
};

const ARTIFACT = 'a'.repeat(64);

function key(init: RequestInit, artifactSha256 = ARTIFACT): string {
  return cacheKey(create(InferenceRequestSchema, init), artifactSha256).toString('hex');
}

function withInput(index: number, change: Partial<TensorInit>): RequestInit {
  const inputs = base.inputs.map((input, i) => (i === index ? { ...input, ...change } : input));
  return { ...base, inputs };
}

/** The key's byte stream as its documentation lays it out, field by field: what keys stored before must keep matching. */
function documentedKey(init: RequestInit, artifactSha256: string, scope: string): string {
  const field = (value: string | Uint8Array) => {
    const bytes = typeof value === 'string' ? Buffer.from(value, 'utf8') : Buffer.from(value);
    const length = Buffer.alloc(8);
    length.writeBigUInt64LE(BigInt(bytes.byteLength));
    return [length, bytes];
  };
  const byName = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);
  const inputs = [...init.inputs].sort((a, b) => byName(a.name, b.name));
  const outputs = init.outputNames ?? [];
  const counts = Object.entries(init.outputClassCounts ?? {}).sort(([a], [b]) => byName(a, b));
  const stream = [
    ...field('infermesh.cache.v3'),
    ...field(scope),
    ...field(init.modelName),
    ...field(init.modelVersion ?? ''),
    ...field(artifactSha256),
    ...field(String(inputs.length)),
    ...inputs.flatMap((t) => [
      ...field(t.name),
      ...field(String(t.datatype)),
      ...field(t.shape.join(',')),
      ...field(t.data),
    ]),
    ...field(String(outputs.length)),
    ...outputs.flatMap(field),
    ...field(String(counts.length)),
    ...counts.flatMap(([name, count]) => [...field(name), ...field(String(count))]),
  ];
  return createHash('sha256').update(Buffer.concat(stream)).digest('hex');
}

describe('cacheKey', () => {
  it('hashes the documented byte stream, so that keys stored before stay valid', () => {
    const cases: [RequestInit, string][] = [
      [base, ''],
      [{ ...base, outputClassCounts: { z: 3, y: 1 } }, 'key:tenant-é'],
      [withInput(0, { name: 'ünïcode', data: new Uint8Array(70_000).fill(7) }), ''],
      [{ modelName: 'm', inputs: [] }, ''],
    ];
    for (const [init, scope] of cases) {
      expect(cacheKey(create(InferenceRequestSchema, init), ARTIFACT, scope).toString('hex')).toBe(
        documentedKey(init, ARTIFACT, scope),
      );
    }
  });

  it('is a SHA-256 digest, the same for the same request', () => {
    expect(cacheKey(create(InferenceRequestSchema, base), ARTIFACT)).toHaveLength(32);
    expect(key(base)).toBe(key({ ...base }));
  });

  it('changes with the scope (a tenant), and does not depend on the tenant or routing key fields themselves', () => {
    const request = create(InferenceRequestSchema, base);
    expect(cacheKey(request, ARTIFACT, 'key:a').equals(cacheKey(request, ARTIFACT, 'key:b'))).toBe(false);
    expect(cacheKey(request, ARTIFACT, 'key:a').equals(cacheKey(request, ARTIFACT))).toBe(false);
    const other = create(InferenceRequestSchema, { ...base, tenant: 'key:a', routingKey: 'user-1' });
    expect(cacheKey(other, ARTIFACT).equals(cacheKey(request, ARTIFACT))).toBe(true);
  });

  it('changes with the artifact: the same model and version id with other weights (deleted and created again) is another result', () => {
    expect(key(base, 'b'.repeat(64))).not.toBe(key(base));
  });

  it('cannot collide by moving bytes between the version and the artifact', () => {
    expect(key({ ...base, modelVersion: '3a' }, 'a'.repeat(63))).not.toBe(key(base));
  });

  it('does not depend on the order of the inputs', () => {
    expect(key({ ...base, inputs: [...base.inputs].reverse() })).toBe(key(base));
  });

  it('does not depend on the client request id', () => {
    expect(key({ ...base, id: 'another' })).toBe(key(base));
  });

  it.each<[string, RequestInit]>([
    ['model', { ...base, modelName: 'mlp2' }],
    ['version', { ...base, modelVersion: '4' }],
    ['input name', withInput(0, { name: 'c' })],
    ['datatype', withInput(1, { datatype: DataType.UINT32 })],
    ['shape', withInput(0, { shape: [2n, 1n] })],
    ['shape rank', withInput(0, { shape: [1n, 2n, 1n] })],
    ['one byte of data', withInput(0, { data: Uint8Array.of(1, 2, 3, 4, 5, 6, 7, 9) })],
    ['data length', withInput(1, { data: Uint8Array.of(9, 0, 0, 0, 0) })],
    ['requested outputs', { ...base, outputNames: ['y'] }],
    ['no requested outputs', { ...base, outputNames: [] }],
    ['a repeated output', { ...base, outputNames: ['y', 'z', 'z'] }],
    ['class count asked of an output', { ...base, outputClassCounts: { y: 3 } }],
    [
      'an extra input',
      {
        ...base,
        inputs: [...base.inputs, { name: 'c', datatype: DataType.BOOL, shape: [1n], data: Uint8Array.of(1) }],
      },
    ],
  ])('changes with the %s', (_label, changed) => {
    expect(key(changed)).not.toBe(key(base));
  });

  it('changes with the class count asked, and with the output it is asked of', () => {
    const three = key({ ...base, outputClassCounts: { y: 3 } });
    expect(key({ ...base, outputClassCounts: { y: 2 } })).not.toBe(three);
    expect(key({ ...base, outputClassCounts: { z: 3 } })).not.toBe(three);
    expect(key({ ...base, outputClassCounts: { y: 3, z: 3 } })).not.toBe(three);
  });

  it('does not depend on the order in which class counts were given', () => {
    expect(key({ ...base, outputClassCounts: { y: 3, z: 1 } })).toBe(
      key({ ...base, outputClassCounts: { z: 1, y: 3 } }),
    );
  });

  it('cannot collide by moving digits between an output name and its class count', () => {
    expect(key({ ...base, outputClassCounts: { y1: 2 } })).not.toBe(key({ ...base, outputClassCounts: { y: 12 } }));
  });

  it('changes with the order of the requested outputs, which is the order of the response', () => {
    expect(key({ ...base, outputNames: ['z', 'y'] })).not.toBe(key(base));
  });

  it('cannot collide by moving bytes between model and version', () => {
    expect(key({ ...base, modelName: 'mlp3', modelVersion: '' })).not.toBe(
      key({ ...base, modelName: 'mlp', modelVersion: '3' }),
    );
  });

  it('cannot collide by moving bytes between an input name and its data', () => {
    const one: RequestInit = {
      modelName: 'm',
      inputs: [{ name: 'ab', datatype: DataType.UINT8, shape: [1n], data: Uint8Array.of(1) }],
    };
    const other: RequestInit = {
      modelName: 'm',
      inputs: [{ name: 'a', datatype: DataType.UINT8, shape: [1n], data: Uint8Array.of(0x62, 1) }],
    };

    expect(key(one)).not.toBe(key(other));
  });

  it('cannot collide by moving bytes between the data of two inputs', () => {
    const split = (left: number[], right: number[]): RequestInit => ({
      modelName: 'm',
      inputs: [
        { name: 'a', datatype: DataType.UINT8, shape: [-1n], data: Uint8Array.from(left) },
        { name: 'b', datatype: DataType.UINT8, shape: [-1n], data: Uint8Array.from(right) },
      ],
    });

    expect(key(split([1, 2], [3]))).not.toBe(key(split([1], [2, 3])));
  });

  it('cannot collide by splitting one output name into two', () => {
    expect(key({ ...base, outputNames: ['y\u0000z'] })).not.toBe(key({ ...base, outputNames: ['y', 'z'] }));
  });

  it('cannot collide by moving dimensions between shape entries', () => {
    expect(key(withInput(0, { shape: [12n, 3n] }))).not.toBe(key(withInput(0, { shape: [1n, 23n] })));
  });
});
