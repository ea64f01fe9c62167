import { API_KEY, type Fixture, startFixture } from './support/system-fixture';
import { kserveClient } from './support/kserve-grpc-client';

/**
 * The classifier demo model, registered with its processing: "input" normalized per feature with
 * mean [1, 2, 3, 4] and std [2, 4, 0.5, 1], then scores = [y0, y1, y2, y3, (y0 + y1 - y2 - y3) / 2 + 0.25]
 * labelled cat, dog, bird, fish, mixed. Every number below is worked out by hand from those.
 */
const ROWS = [
  // y = [(3-1)/2, (10-2)/4, (3.5-3)/0.5, (2-4)/1] = [1, 2, 1, -2]; class 4: (1 + 2 - 1 + 2) / 2 + 0.25 = 2.25.
  // Without the normalization the scores would be [3, 10, 3.5, 2, 4]: "dog" first.
  { x: [3, 10, 3.5, 2], scores: [1, 2, 1, -2, 2.25] },
  // y = [0, 0, 0, 0]: only the bias of class 4 is left.
  { x: [1, 2, 3, 4], scores: [0, 0, 0, 0, 0.25] },
];
const INPUT = { name: 'input', shape: [2, 4], datatype: 'FP32', data: ROWS.flatMap((r) => r.x) };

/** BYTES raw contents as strings: each element a 4-byte little-endian length, then its bytes. */
function bytesElements(raw: Buffer): string[] {
  const out: string[] = [];
  for (let offset = 0; offset < raw.length;) {
    const length = raw.readUInt32LE(offset);
    out.push(raw.subarray(offset + 4, offset + 4 + length).toString('utf8'));
    offset += 4 + length;
  }
  return out;
}

describe('pre- and post-processing declared in the registry, run by the worker', () => {
  let fixture: Fixture;
  let url: string;
  let grpcClient: ReturnType<typeof kserveClient>;
  const auth = { authorization: `Bearer ${API_KEY}` };

  const infer = async (body: unknown) => {
    const res = await fetch(`${url}/v2/models/classifier/infer`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...auth },
      body: JSON.stringify(body),
    });
    return { status: res.status, json: (await res.json()) as Record<string, unknown> & { error?: string } };
  };

  beforeAll(async () => {
    fixture = await startFixture({ models: ['classifier'] });
    url = fixture.system.gatewayUrl;
    grpcClient = kserveClient(fixture.system.gatewayGrpcAddress);
  });

  afterAll(async () => {
    grpcClient?.close();
    await fixture?.stop();
  });

  it('normalizes the input before the model runs, exactly as computed by hand', async () => {
    const { status, json } = await infer({ inputs: [INPUT] });
    expect(status).toBe(200);
    expect(json['outputs']).toEqual([
      { name: 'scores', datatype: 'FP32', shape: [2, 5], data: ROWS.flatMap((r) => r.scores) },
    ]);
  });

  it('answers REST class_count with the top classes as "score:index:label", ties by lower index', async () => {
    const { status, json } = await infer({
      inputs: [INPUT],
      outputs: [{ name: 'scores', parameters: { class_count: 3 } }],
    });
    expect(status).toBe(200);
    expect(json['outputs']).toEqual([
      {
        name: 'scores',
        datatype: 'BYTES',
        shape: [2, 3],
        data: [
          '2.250000:4:mixed',
          '2.000000:1:dog',
          '1.000000:0:cat',
          '0.250000:4:mixed',
          '0.000000:0:cat',
          '0.000000:1:dog',
        ],
      },
    ]);
  });

  it('answers gRPC class_count (int64_param) with BYTES raw output contents', async () => {
    const response = await grpcClient.call<{
      outputs: { name: string; datatype: string; shape: string[] }[];
      raw_output_contents: Buffer[];
    }>(
      'ModelInfer',
      {
        model_name: 'classifier',
        inputs: [{ name: 'input', datatype: 'FP32', shape: [2, 4] }],
        outputs: [{ name: 'scores', parameters: { class_count: { int64_param: 2 } } }],
        raw_input_contents: [Buffer.from(Float32Array.from(INPUT.data).buffer)],
      },
      API_KEY,
    );
    expect(response.outputs).toEqual([
      expect.objectContaining({ name: 'scores', datatype: 'BYTES', shape: ['2', '2'] }),
    ]);
    expect(bytesElements(response.raw_output_contents[0]!)).toEqual([
      '2.250000:4:mixed',
      '2.000000:1:dog',
      '0.250000:4:mixed',
      '0.000000:0:cat',
    ]);
  });

  it('does not answer one class_count from the cached result of another, or of none', async () => {
    const top = async (classCount?: number) => {
      const outputs =
        classCount === undefined ? undefined : [{ name: 'scores', parameters: { class_count: classCount } }];
      const { json } = await infer({
        inputs: [{ ...INPUT, shape: [1, 4], data: ROWS[0]!.x }],
        ...(outputs && { outputs }),
      });
      return (json['outputs'] as { data: unknown[] }[])[0]!.data;
    };
    expect(await top(1)).toEqual(['2.250000:4:mixed']);
    expect(await top(2)).toEqual(['2.250000:4:mixed', '2.000000:1:dog']);
    expect(await top()).toEqual(ROWS[0]!.scores);
    expect(await top(1)).toEqual(['2.250000:4:mixed']);
  });

  it.each<[string, unknown, RegExp]>([
    ['0', 0, /output "scores": parameter "class_count" must be a positive integer/],
    ['not an integer', 2.5, /output "scores": parameter "class_count" must be a positive integer/],
    ['more than the 5 classes', 6, /output "scores" has 5 classes per item, fewer than the 6 class_count asks for/],
  ])('answers 400 naming the output to a class_count that is %s', async (_label, classCount, message) => {
    const { status, json } = await infer({
      inputs: [INPUT],
      outputs: [{ name: 'scores', parameters: { class_count: classCount } }],
    });
    expect(status).toBe(400);
    expect(json.error).toMatch(message);
  });

  it('answers INVALID_ARGUMENT over gRPC to a class_count beyond the classes', async () => {
    await expect(
      grpcClient.call(
        'ModelInfer',
        {
          model_name: 'classifier',
          inputs: [{ name: 'input', datatype: 'FP32', shape: [1, 4] }],
          outputs: [{ name: 'scores', parameters: { class_count: { int64_param: 9 } } }],
          raw_input_contents: [Buffer.from(Float32Array.from(ROWS[0]!.x).buffer)],
        },
        API_KEY,
      ),
    ).rejects.toMatchObject({ code: 3, details: expect.stringContaining('output "scores"') });
  });
});
