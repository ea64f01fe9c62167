import { create } from '@bufbuild/protobuf';
import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import { thrownBy } from '@infermesh/testing';
import {
  type InferParameter,
  InferParameterSchema,
  ModelInferRequestSchema,
} from '@infermesh/proto/gen/inference/grpc_service_pb';
import { inferRequestFromGrpc } from './grpc-codec';
import { edgeParameters, outputClassCounts, parametersFromJson } from './infer-parameters';
import { inferRequestFromJson } from './rest-codec';

const refusal = (call: () => unknown): RpcError => thrownBy(call, RpcError);

const INPUTS = [{ name: 'x', shape: [1], datatype: 'FP32', data: [1] }];
const int64 = (value: bigint): InferParameter =>
  create(InferParameterSchema, { parameterChoice: { case: 'int64Param', value } });

describe(outputClassCounts.name, () => {
  it('reads class_count from each requested output that has one', () => {
    const sut = outputClassCounts([
      { name: 'scores', parameters: { class_count: int64(3n) } },
      { name: 'embedding', parameters: {} },
      { name: 'logits', parameters: parametersFromJson('output "logits"', { class_count: 1, binary_data: false }) },
    ]);
    expect(sut).toEqual({ scores: 3, logits: 1 });
  });

  it('accepts uint64 and integral double parameters, as other clients send them', () => {
    const uint64 = create(InferParameterSchema, { parameterChoice: { case: 'uint64Param', value: 5n } });
    const double = create(InferParameterSchema, { parameterChoice: { case: 'doubleParam', value: 2 } });
    expect(
      outputClassCounts([
        { name: 'a', parameters: { class_count: uint64 } },
        { name: 'b', parameters: { class_count: double } },
      ]),
    ).toEqual({ a: 5, b: 2 });
  });

  it.each<[string, InferParameter, string]>([
    ['zero', int64(0n), 'got 0'],
    ['negative', int64(-3n), 'got -3'],
    ['beyond uint32', int64(2n ** 32n), 'got 4294967296'],
    ['fractional', create(InferParameterSchema, { parameterChoice: { case: 'doubleParam', value: 2.5 } }), 'got 2.5'],
    ['a string', create(InferParameterSchema, { parameterChoice: { case: 'stringParam', value: '3' } }), 'got "3"'],
    ['a boolean', create(InferParameterSchema, { parameterChoice: { case: 'boolParam', value: true } }), 'got true'],
    ['empty', create(InferParameterSchema), 'got empty'],
  ])('refuses a class_count that is %s with INVALID_ARGUMENT naming the output', (_label, parameter, shown) => {
    const error = refusal(() => outputClassCounts([{ name: 'scores', parameters: { class_count: parameter } }]));
    expect([error.code, error.reason]).toEqual([status.INVALID_ARGUMENT, 'INVALID_TENSOR']);
    expect(error.message).toBe(
      `output "scores": parameter "class_count" must be a positive integer (at most 4294967295), ${shown}`,
    );
  });

  it('refuses an output requested twice with different class counts, and accepts it twice with the same', () => {
    const twice = (a: InferParameter | undefined, b: InferParameter | undefined) =>
      outputClassCounts([
        { name: 'scores', parameters: a === undefined ? {} : { class_count: a } },
        { name: 'scores', parameters: b === undefined ? {} : { class_count: b } },
      ]);
    expect(twice(int64(2n), int64(2n))).toEqual({ scores: 2 });
    expect(refusal(() => twice(int64(2n), int64(3n))).message).toBe(
      'output "scores" is requested more than once with different class_count parameters',
    );
    expect(refusal(() => twice(int64(2n), undefined)).code).toBe(status.INVALID_ARGUMENT);
  });
});

describe('class_count on requested outputs', () => {
  it('reaches the internal request from a REST body', () => {
    const sut = inferRequestFromJson('m', '', {
      inputs: INPUTS,
      outputs: [{ name: 'scores', parameters: { class_count: 3 } }, { name: 'other' }],
    });
    expect(sut.outputNames).toEqual(['scores', 'other']);
    expect(sut.outputClassCounts).toEqual({ scores: 3 });
  });

  it('is absent from a REST request that asks for none', () => {
    expect(inferRequestFromJson('m', '', { inputs: INPUTS }).outputClassCounts).toEqual({});
    expect(
      inferRequestFromJson('m', '', { inputs: INPUTS, outputs: [{ name: 'y', parameters: { binary_data: false } }] })
        .outputClassCounts,
    ).toEqual({});
  });

  it('is refused in a REST body when it is not a positive integer, naming the output', () => {
    for (const classCount of [0, -2, 2.5, '3', null]) {
      const error = refusal(() =>
        inferRequestFromJson('m', '', {
          inputs: INPUTS,
          outputs: [{ name: 'scores', parameters: { class_count: classCount } }],
        }),
      );
      expect([error.code, classCount]).toEqual([status.INVALID_ARGUMENT, classCount]);
      expect(error.message).toMatch(/^output "scores"/);
    }
    expect(
      refusal(() => inferRequestFromJson('m', '', { inputs: INPUTS, outputs: [{ name: 'scores', parameters: 5 }] }))
        .message,
    ).toContain('output "scores" "parameters" must be an object');
  });

  it('reaches the internal request from a gRPC ModelInfer request', () => {
    const sut = inferRequestFromGrpc(
      create(ModelInferRequestSchema, {
        modelName: 'm',
        inputs: [{ name: 'x', datatype: 'FP32', shape: [1n], contents: { fp32Contents: [1] } }],
        outputs: [{ name: 'scores', parameters: { class_count: int64(4n) } }, { name: 'other' }],
      }),
    );
    expect(sut.outputNames).toEqual(['scores', 'other']);
    expect(sut.outputClassCounts).toEqual({ scores: 4 });
  });
});

describe(edgeParameters.name, () => {
  const double = (value: number): InferParameter =>
    create(InferParameterSchema, { parameterChoice: { case: 'doubleParam', value } });
  const text = (value: string): InferParameter =>
    create(InferParameterSchema, { parameterChoice: { case: 'stringParam', value } });

  it('reads the timeout in microseconds as milliseconds, however large (the deadline cuts it later)', () => {
    expect(edgeParameters({})).toEqual({ timeoutMs: undefined });
    expect(edgeParameters({ timeout: int64(1_500n) })).toEqual({ timeoutMs: 2 });
    expect(edgeParameters({ timeout: int64(400000000000000000n) })).toEqual({ timeoutMs: 4e14 });
    expect(edgeParameters(parametersFromJson('the request', { timeout: 400000000000000000 }))).toEqual({
      timeoutMs: 4e14,
    });
  });

  it.each<[string, InferParameter]>([
    ['zero', int64(0n)],
    ['negative', int64(-5n)],
    ['fractional', double(1.5)],
    ['a string', text('soon')],
  ])('refuses a %s timeout, naming it', (_, timeout) => {
    const error = refusal(() => edgeParameters({ timeout }));
    expect(error.code).toBe(status.INVALID_ARGUMENT);
    expect(error.message).toMatch(/^parameter "timeout" must be a positive integer of microseconds, got /);
  });

  it('accepts a non-negative integer priority and refuses anything else, naming it', () => {
    expect(edgeParameters({ priority: int64(0n) })).toEqual({ timeoutMs: undefined });
    expect(edgeParameters({ priority: int64(3n) })).toEqual({ timeoutMs: undefined });
    for (const priority of [int64(-1n), double(0.5), text('high')]) {
      expect(refusal(() => edgeParameters({ priority })).message).toMatch(
        /^parameter "priority" must be a non-negative integer/,
      );
    }
  });

  it('shows at most 40 characters of a string it refuses', () => {
    expect(refusal(() => edgeParameters({ timeout: text('x'.repeat(100_000)) })).message.length).toBeLessThan(150);
  });
});
