import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import {
  type Signature,
  SignatureSchema,
  type WarmUpInputSchema,
  WarmUpSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { encodeBytesElements } from '@infermesh/tensors';
import { thrownBy } from '@infermesh/testing';
import { checkWarmUp, MAX_WARM_UP_DATA_BYTES, MAX_WARM_UP_SAMPLES, sameWarmUp } from './warm-up-check';

/** A voice-activity model's signature: audio FP32 [-1, -1] and sr INT64 [1]; it does not batch. */
function vad(): Signature {
  return create(SignatureSchema, {
    inputs: [
      { name: 'audio', datatype: DataType.FP32, shape: [-1n, -1n] },
      { name: 'sr', datatype: DataType.INT64, shape: [1n] },
    ],
    outputs: [{ name: 'scaled', datatype: DataType.FP32, shape: [-1n, -1n] }],
    maxBatchSize: 0,
  });
}

/** A model that batches up to 8: text BYTES [-1, 2] and x FP32 [-1, 3]. */
function batching(): Signature {
  return create(SignatureSchema, {
    inputs: [
      { name: 'text', datatype: DataType.BYTES, shape: [-1n, 2n] },
      { name: 'x', datatype: DataType.FP32, shape: [-1n, 3n] },
    ],
    outputs: [{ name: 'y', datatype: DataType.FP32, shape: [-1n, 3n] }],
    maxBatchSize: 8,
  });
}

type Init = MessageInitShape<typeof WarmUpSchema>;
const floats = (...values: number[]) => new Uint8Array(Float32Array.from(values).buffer);
const int64s = (...values: number[]) => new Uint8Array(BigInt64Array.from(values.map(BigInt)).buffer);

type InputInit = MessageInitShape<typeof WarmUpInputSchema>;
const audioIn: InputInit = {
  name: 'audio',
  shape: [1n, 4n],
  contents: { case: 'data', value: floats(0.1, 0.2, 0.3, 0.4) },
};
const srIn = (rate = 16000): InputInit => ({
  name: 'sr',
  datatype: DataType.INT64,
  shape: [1n],
  contents: { case: 'data', value: int64s(rate) },
});
const vadSample = (rate = 16000) => [{ name: '16 kHz', inputs: [audioIn, srIn(rate)] }];

const refusal = (init: Init, signature = vad()): RpcError =>
  thrownBy(() => checkWarmUp(create(WarmUpSchema, init), signature), RpcError);

describe(checkWarmUp.name, () => {
  it('accepts samples that fit the signature and fills in each input datatype from it', () => {
    const sut = checkWarmUp(create(WarmUpSchema, { samples: vadSample() }), vad());
    expect(sut!.samples[0]!.inputs.map((i) => [i.name, i.datatype])).toEqual([
      ['audio', DataType.FP32],
      ['sr', DataType.INT64],
    ]);
    expect(sut!.samples[0]!.inputs[0]!.shape).toEqual([1n, 4n]);
  });

  it('accepts generated contents with a concrete shape and BYTES data, within the batch size', () => {
    const sut = checkWarmUp(
      create(WarmUpSchema, {
        samples: [
          {
            inputs: [
              {
                name: 'text',
                shape: [2n, 2n],
                contents: { case: 'data', value: encodeBytesElements(['a', 'b', 'c', 'd'].map((s) => Buffer.from(s))) },
              },
              { name: 'x', shape: [2n, 3n], contents: { case: 'randomData', value: true } },
            ],
          },
          {
            inputs: [
              { name: 'text', shape: [8n, 2n], contents: { case: 'zeroData', value: true } },
              { name: 'x', shape: [8n, 3n], contents: { case: 'zeroData', value: true } },
            ],
          },
        ],
      }),
      batching(),
    );
    expect(sut!.samples).toHaveLength(2);
  });

  it('stores nothing for no warm-up or one without samples', () => {
    expect(checkWarmUp(undefined, vad())).toBeUndefined();
    expect(checkWarmUp(create(WarmUpSchema), vad())).toBeUndefined();
  });

  it.each<[string, Init, RegExp, Signature]>([
    [
      'an unknown input',
      {
        samples: [
          {
            inputs: [...[audioIn, srIn()], { name: 'state', shape: [1n], contents: { case: 'zeroData', value: true } }],
          },
        ],
      },
      /samples\[0\]: the model has no input "state"; its inputs are "audio", "sr"/,
      vad(),
    ],
    [
      'a missing input',
      { samples: [{ name: 'short', inputs: [audioIn] }] },
      /samples\[0\] \("short"\) gives no value for input "sr"/,
      vad(),
    ],
    [
      'an input given twice',
      { samples: [{ inputs: [...[audioIn, srIn()], srIn()] }] },
      /input "sr" is given more than once/,
      vad(),
    ],
    [
      'another datatype',
      {
        samples: [
          {
            inputs: [
              audioIn,
              { name: 'sr', datatype: DataType.INT32, shape: [1n], contents: { case: 'zeroData', value: true } },
            ],
          },
        ],
      },
      /input "sr" has datatype INT32 but the model expects INT64/,
      vad(),
    ],
    [
      'a dynamic dimension left -1',
      {
        samples: [
          { inputs: [{ name: 'audio', shape: [1n, -1n], contents: { case: 'zeroData', value: true } }, srIn()] },
        ],
      },
      /input "audio" has shape \[1,-1\] but the model expects \[-1,-1\]; give a concrete size/,
      vad(),
    ],
    [
      'a fixed dimension changed',
      { samples: [{ inputs: [audioIn, { name: 'sr', shape: [2n], contents: { case: 'zeroData', value: true } }] }] },
      /input "sr" has shape \[2\] but the model expects \[1\]/,
      vad(),
    ],
    [
      'data that does not fit the shape',
      {
        samples: [
          { inputs: [{ name: 'audio', shape: [1n, 5n], contents: { case: 'data', value: floats(1, 2) } }, srIn()] },
        ],
      },
      /samples\[0\] input "audio" has 8 bytes of data but shape \[1,5\] of FP32 needs 20/,
      vad(),
    ],
    [
      'no contents',
      { samples: [{ inputs: [{ name: 'audio', shape: [1n, 4n] }, srIn()] }] },
      /input "audio" has no contents; give data, zero_data or random_data/,
      vad(),
    ],
    [
      'too many elements',
      {
        samples: [
          { inputs: [{ name: 'audio', shape: [4096n, 8192n], contents: { case: 'zeroData', value: true } }, srIn()] },
        ],
      },
      /33554432 elements, above the limit of 16777216/,
      vad(),
    ],
    [
      'a batch above the max batch size',
      {
        samples: [
          {
            inputs: [
              { name: 'text', shape: [9n, 2n], contents: { case: 'zeroData', value: true } },
              { name: 'x', shape: [9n, 3n], contents: { case: 'zeroData', value: true } },
            ],
          },
        ],
      },
      /input "text" has batch size 9; the model batches 1 to 8 items/,
      batching(),
    ],
    [
      'batch sizes that differ',
      {
        samples: [
          {
            inputs: [
              { name: 'text', shape: [1n, 2n], contents: { case: 'zeroData', value: true } },
              { name: 'x', shape: [2n, 3n], contents: { case: 'zeroData', value: true } },
            ],
          },
        ],
      },
      /input "x" has batch size 2 but another input of the sample has 1/,
      batching(),
    ],
    [
      'a BYTES element with a NUL byte',
      {
        samples: [
          {
            inputs: [
              {
                name: 'text',
                shape: [1n, 2n],
                contents: { case: 'data', value: encodeBytesElements([Buffer.from('a'), Buffer.from('b\0')]) },
              },
              { name: 'x', shape: [1n, 3n], contents: { case: 'zeroData', value: true } },
            ],
          },
        ],
      },
      /input "text": BYTES element 1 contains a NUL byte/,
      batching(),
    ],
  ])('refuses %s with INVALID_ARGUMENT naming the sample and the input', (_, init, message, signature) => {
    const error = refusal(init, signature);
    expect(error.code).toBe(status.INVALID_ARGUMENT);
    expect(error.message).toMatch(/^warm_up: /);
    expect(error.message).toMatch(message);
  });

  it('refuses more samples or data than its limits, naming them', () => {
    const many = Array.from({ length: MAX_WARM_UP_SAMPLES + 1 }, () => vadSample()[0]!);
    expect(refusal({ samples: many }).message).toMatch(
      /17 samples are given, above the limit of 16 \(MAX_WARM_UP_SAMPLES\)/,
    );
    const samples = MAX_WARM_UP_DATA_BYTES / 4 / 2 + 1;
    const big = {
      name: 'audio',
      shape: [1n, BigInt(samples)],
      contents: { case: 'data' as const, value: new Uint8Array(samples * 4) },
    };
    expect(refusal({ samples: [{ inputs: [big, srIn()] }, { inputs: [big, srIn()] }] }).message).toMatch(
      /1048600 bytes of data, above the limit of 1048576 \(1 MiB, MAX_WARM_UP_DATA_BYTES\)/,
    );
  });
});

describe(sameWarmUp.name, () => {
  it('compares warm-ups as stored: an unspecified datatype equals the signature one, any other difference is different', () => {
    const stored = checkWarmUp(create(WarmUpSchema, { samples: vadSample() }), vad());
    expect(sameWarmUp(stored, create(WarmUpSchema, { samples: vadSample() }), vad())).toBe(true);
    expect(sameWarmUp(stored, create(WarmUpSchema, { samples: vadSample(8000) }), vad())).toBe(false);
    expect(sameWarmUp(stored, undefined, vad())).toBe(false);
    expect(sameWarmUp(undefined, create(WarmUpSchema), vad())).toBe(true);
  });
});
