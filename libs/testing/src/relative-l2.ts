/** ‖candidate − reference‖₂ ÷ ‖reference‖₂: how far a result (a quantized model's, say) is from its reference. */
export function relativeL2(reference: ArrayLike<number>, candidate: ArrayLike<number>): number {
  let diff = 0;
  let norm = 0;
  for (let i = 0; i < reference.length; i++) {
    diff += (candidate[i]! - reference[i]!) ** 2;
    norm += reference[i]! ** 2;
  }
  return Math.sqrt(diff / norm);
}
