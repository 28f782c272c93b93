//! BYTES framing: `check_bytes_framing` and `BytesElements` on arbitrary buffers. A buffer that
//! passes must re-frame to exactly the same bytes.
#![no_main]

use kiln::core::tensor::{check_bytes_framing, frame_bytes, BytesElements};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&expected, buf)) = data.split_first() else {
        return;
    };
    let elements: Result<Vec<&[u8]>, _> = BytesElements::new(buf).collect();
    let checked = check_bytes_framing(buf, usize::from(expected));
    match elements {
        Ok(elements) => {
            assert_eq!(&frame_bytes(&elements)[..], buf);
            assert_eq!(checked.is_ok(), elements.len() == usize::from(expected));
        }
        Err(_) => assert!(checked.is_err()),
    }
});
