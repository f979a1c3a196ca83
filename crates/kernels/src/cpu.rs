//! Run-time CPU feature detection, in one place.

/// True when the CPU has AVX2 and FMA (and F16C, which every CPU with both has: the GEMM's
/// row kernels widen f16 panels with it), so the hand-vectorised paths may run.
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when the CPU has AVX-512F on top of AVX2 and FMA, so the 16-lane paths may run.
pub fn has_avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx2_fma() && std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when the CPU has F16C (hardware f16 <-> f32 conversion) on top of AVX2.
pub fn has_f16c() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx2_fma() && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Defines a function that runs `$body` compiled for AVX2+FMA when the CPU has them and the
/// portable build of the same body otherwise. `$body` should be `#[inline(always)]` so that its
/// loops are vectorised for the wider target.
macro_rules! dispatch_avx2 {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? = $body:path;) => {
        $(#[$attr])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn wide($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                if $crate::cpu::has_avx2_fma() {
                    // SAFETY: the CPU supports AVX2 and FMA, checked just above.
                    return unsafe { wide($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}
pub(crate) use dispatch_avx2;

/// As [`dispatch_avx2`], with a first choice compiled for AVX-512F where the CPU has it: for
/// compute-bound loops (the transcendental functions), where twice the lanes per instruction
/// also let the out-of-order core overlap twice the elements of their long dependency chains.
/// Element-wise bodies give the same bits on every path (the same operations per element).
macro_rules! dispatch_avx512 {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? = $body:path;) => {
        $(#[$attr])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn widest($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                if $crate::cpu::has_avx512f() {
                    // SAFETY: the CPU supports AVX-512F, AVX2 and FMA, checked just above.
                    return unsafe { widest($($arg),*) };
                }
            }
            $crate::cpu::dispatch_avx2! {
                fn narrower($($arg: $ty),*) $(-> $ret)? = $body;
            }
            narrower($($arg),*)
        }
    };
}
pub(crate) use dispatch_avx512;
