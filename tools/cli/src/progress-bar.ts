import type { TextSink } from './cli-io';
import { formatBytes, formatRate } from './output/format';

/**
 * bar: one line redrawn in place (a terminal); lines: a line at each quarter (a log file or pipe);
 * off: nothing (--json).
 */
export type ProgressMode = 'bar' | 'lines' | 'off';

export interface ProgressBarOptions {
  /** What moves, e.g. the file name. */
  label: string;
  totalBytes: number;
  mode: ProgressMode;
  /** Milliseconds, for the rate; performance.now by default. */
  now?: () => number;
  /** Cells of the bar. */
  width?: number;
}

/** The least time between two redraws of the bar, so a fast upload does not flood the terminal. */
const REDRAW_MS = 100;

/** The progress of a transfer on stderr: bytes done, percent and rate. */
export class ProgressBar {
  private readonly now: () => number;
  private readonly started: number;
  private lastDraw = Number.NEGATIVE_INFINITY;
  private quartersShown = 0;
  private done = 0;
  private finished = false;

  constructor(
    private readonly sink: TextSink,
    private readonly options: ProgressBarOptions,
  ) {
    this.now = options.now ?? (() => performance.now());
    this.started = this.now();
  }

  /** Records that `doneBytes` bytes in all have moved. */
  update(doneBytes: number): void {
    this.done = doneBytes;
    switch (this.options.mode) {
      case 'bar': {
        const now = this.now();
        if (now - this.lastDraw < REDRAW_MS && doneBytes < this.options.totalBytes) return;
        this.lastDraw = now;
        this.sink.write(`\r${this.barLine()}\x1b[K`);
        return;
      }
      case 'lines': {
        const quarters = Math.floor(this.fraction() * 4);
        if (quarters > this.quartersShown) {
          this.quartersShown = quarters;
          this.sink.write(`${this.options.label}: ${Math.round(quarters * 25)}% ${this.amounts()}\n`);
        }
        return;
      }
      case 'off':
        return;
    }
  }

  /** Draws the final state; the bar's line ends. */
  finish(): void {
    if (this.finished) return;
    this.finished = true;
    if (this.options.mode === 'bar') this.sink.write(`\r${this.barLine()}\x1b[K\n`);
    else if (this.options.mode === 'lines' && this.quartersShown < 4)
      this.sink.write(`${this.options.label}: ${Math.round(this.fraction() * 100)}% ${this.amounts()}\n`);
  }

  private fraction(): number {
    return this.options.totalBytes <= 0 ? 1 : Math.min(1, this.done / this.options.totalBytes);
  }

  private amounts(): string {
    const seconds = (this.now() - this.started) / 1000;
    const rate = seconds > 0 ? formatRate(this.done / seconds) : '';
    return `(${formatBytes(this.done)} of ${formatBytes(this.options.totalBytes)}${rate === '' ? '' : `, ${rate}`})`;
  }

  private barLine(): string {
    const width = this.options.width ?? 30;
    const filled = Math.round(this.fraction() * width);
    const percent = `${Math.floor(this.fraction() * 100)}%`.padStart(4);
    return `${this.options.label} [${'#'.repeat(filled)}${'-'.repeat(width - filled)}] ${percent} ${this.amounts()}`;
  }
}
