import { type MeshPolicy, parseMeshPolicy } from '@infermesh/mesh';
import { readFileSync, unwatchFile, watchFile } from 'node:fs';

/** What happened when the policy file changed. */
export type PolicyChange = { kind: 'applied'; policy: MeshPolicy } | { kind: 'refused'; problems: readonly string[] };

/**
 * The mesh policy file, read and validated at start-up (a bad one stops the registry, naming the
 * field) and watched afterwards: a change that validates replaces the running policy; one that does
 * not is refused with its problems, and the running policy stays.
 */
export class MeshPolicyFile {
  private current: MeshPolicy;
  private lastText: string;

  constructor(
    readonly path: string,
    private readonly pollMs: number,
  ) {
    this.lastText = readFileSync(path, 'utf8');
    this.current = parseMeshPolicy(this.lastText, path);
  }

  get policy(): MeshPolicy {
    return this.current;
  }

  /** Starts watching; `onChange` hears of each change of the file's content. */
  watch(onChange: (change: PolicyChange) => void): void {
    watchFile(this.path, { interval: this.pollMs, persistent: false }, () => {
      const change = this.reload();
      if (change !== undefined) onChange(change);
    });
  }

  /** Reads the file again; undefined when its content did not change. */
  reload(): PolicyChange | undefined {
    let text: string;
    try {
      text = readFileSync(this.path, 'utf8');
    } catch (error) {
      return { kind: 'refused', problems: [`cannot read ${this.path}: ${(error as NodeJS.ErrnoException).message}`] };
    }
    if (text === this.lastText) return undefined;
    this.lastText = text;
    try {
      this.current = parseMeshPolicy(text, this.path);
      return { kind: 'applied', policy: this.current };
    } catch (error) {
      const problems = (error as { problems?: readonly string[] }).problems ?? [String(error)];
      return { kind: 'refused', problems };
    }
  }

  close(): void {
    unwatchFile(this.path);
  }
}
