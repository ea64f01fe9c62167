import { DataType } from '@infermesh/proto/gen/infermesh/inference/v1/inference_pb';
import { decodeBytesElements } from '@infermesh/tensors';
import { thrownBy } from '@infermesh/testing';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CommandFailure } from './cli-errors';
import { MAX_WARM_UP_FILE_BYTES, parseWarmUp, readWarmUpFile } from './warm-up-file';

const refusal = (json: unknown) => thrownBy(() => parseWarmUp(json, 'samples.json'), CommandFailure).message;

describe(parseWarmUp.name, () => {
  it('reads one sample of KServe-style named tensors, nested or flat data, into raw little-endian bytes', () => {
    const sut = parseWarmUp(
      {
        inputs: [
          {
            name: 'audio',
            datatype: 'FP32',
            shape: [2, 2],
            data: [
              [0.5, 1],
              [2, -3],
            ],
          },
          { name: 'sr', datatype: 'INT64', shape: [1], data: [16000] },
          { name: 'text', datatype: 'BYTES', shape: [1], data: ['hi'] },
        ],
      },
      'samples.json',
    );
    expect(sut.samples).toHaveLength(1);
    const [audio, sr, text] = sut.samples[0]!.inputs;
    expect([audio!.datatype, audio!.shape, audio!.contents.value]).toEqual([
      DataType.FP32,
      [2n, 2n],
      new Uint8Array(Float32Array.of(0.5, 1, 2, -3).buffer),
    ]);
    expect(sr!.contents.value).toEqual(new Uint8Array(BigInt64Array.of(16000n).buffer));
    expect(decodeBytesElements(text!.contents.value as Uint8Array)!.map(String)).toEqual(['hi']);
  });

  it('reads named samples, with zero or random data and the datatype left to the model', () => {
    const sut = parseWarmUp(
      {
        samples: [
          { name: '16 kHz', inputs: [{ name: 'audio', shape: [1, 512], random_data: true }] },
          { inputs: [{ name: 'audio', datatype: 'FP32', shape: [1, 0], zero_data: true }] },
        ],
      },
      'samples.json',
    );
    expect(sut.samples.map((s) => [s.name, s.inputs[0]!.datatype, s.inputs[0]!.contents.case])).toEqual([
      ['16 kHz', DataType.UNSPECIFIED, 'randomData'],
      ['', DataType.FP32, 'zeroData'],
    ]);
  });

  it.each<[string, unknown, string]>([
    ['not an object', [1], 'samples.json: expected an object with "inputs" (one sample) or "samples"'],
    [
      'both forms',
      { inputs: [], samples: [] },
      'samples.json: give either "inputs" (one sample) or "samples", not both',
    ],
    [
      'an unknown key',
      { inputs: [{ name: 'sr', shape: [1], zeros: true }] },
      'samples.json: inputs[0] ("sr"): unknown key "zeros"; an input has "name", "datatype", "shape", "data", "zero_data", "random_data"',
    ],
    [
      'a dynamic size',
      { inputs: [{ name: 'audio', shape: [1, -1], zero_data: true }] },
      'samples.json: inputs[0] ("audio"): "shape" must be an array of sizes (integers, 0 or more), the concrete shape of the sample',
    ],
    [
      'data without datatype',
      { inputs: [{ name: 'sr', shape: [1], data: [16000] }] },
      'samples.json: inputs[0] ("sr"): "data" needs its "datatype"',
    ],
    [
      'two contents',
      { inputs: [{ name: 'sr', datatype: 'INT64', shape: [1], data: [1], zero_data: true }] },
      'samples.json: inputs[0] ("sr"): give exactly one of "data", "zero_data": true or "random_data": true',
    ],
    [
      'an unknown datatype',
      { samples: [{ inputs: [{ name: 'sr', datatype: 'LONG', shape: [1], data: [1] }] }] },
      'samples.json: samples[0].inputs[0] ("sr"): "datatype" must be one of',
    ],
    [
      'too little data',
      { inputs: [{ name: 'audio', datatype: 'FP32', shape: [1, 3], data: [1, 2] }] },
      'samples.json: inputs[0]: input "audio": data has 2 elements but its shape needs 3',
    ],
    [
      'a sample without inputs',
      { samples: [{ name: 'x' }] },
      'samples.json: samples[0]: "inputs" must be an array of named tensors',
    ],
  ])('refuses %s, naming the file and the entry', (_, json, message) => {
    expect(refusal(json)).toContain(message);
  });
});

describe(readWarmUpFile.name, () => {
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), 'warm-up-file-'))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('refuses a missing file, one that is not JSON, and one over the size limit', async () => {
    await expect(readWarmUpFile(join(dir, 'missing.json'))).rejects.toThrow(
      `cannot read --warmup ${join(dir, 'missing.json')}: no such file`,
    );
    writeFileSync(join(dir, 'bad.json'), '{"inputs": [');
    await expect(readWarmUpFile(join(dir, 'bad.json'))).rejects.toThrow(
      `--warmup ${join(dir, 'bad.json')} is not JSON`,
    );
    writeFileSync(join(dir, 'big.json'), Buffer.alloc(MAX_WARM_UP_FILE_BYTES + 1, 32));
    await expect(readWarmUpFile(join(dir, 'big.json'))).rejects.toThrow(
      'has 8.0 MiB, above the limit of 8.0 MiB; give large inputs as "zero_data" or "random_data"',
    );
  });
});
