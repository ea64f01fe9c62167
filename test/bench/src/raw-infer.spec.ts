import { fromBinary } from '@bufbuild/protobuf';
import { ModelInferRequestSchema } from '@infermesh/proto/gen/inference/grpc_service_pb';
import { seededRequests } from './raw-infer';

describe(seededRequests.name, () => {
  it('gives every seed the benchmarks use a request of its own, the seed read back from its input', () => {
    const withSeed = seededRequests('mlp', [512]);
    // The seeds of the path benchmark's phases and warm-ups reach 9e8, far above 2^24, where float32
    // holds only every 64th integer.
    for (const base of [0, 2e7, 4e7 + 16e5, 9e8]) {
      const seen = new Set<string>();
      for (let seed = base; seed < base + 2_000; seed++) {
        const request = fromBinary(ModelInferRequestSchema, withSeed(seed));
        const input = new Float32Array(new Uint8Array(request.rawInputContents[0]!).buffer);
        expect(input[0]! + input[1]! * 65_536).toBe(seed);
        expect(input.slice(2).every((v) => v === 1)).toBe(true);
        seen.add(Buffer.from(request.rawInputContents[0]!).toString('hex'));
      }
      expect(seen.size).toBe(2_000);
    }
  });
});
